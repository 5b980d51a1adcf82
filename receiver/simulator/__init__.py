"""The service emulated: the sender (receiver.simulate) and the fake upstream API
(upstream.py, population.py, served by serve.py), and the one-command demo (demo.py)."""
