"""attention-receiver: verify, keep and route the Attention Scoring Service's webhooks."""

__version__ = "0.1.0"
