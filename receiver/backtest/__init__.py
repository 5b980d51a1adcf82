"""History: `receiver backtest` (a rules file replayed on a stored period), its parallel
runner, its results and the noise report."""
