"""The service emulated: the sender (walk.py, its sessions; sender.py, its deliveries and
retries; `receiver simulate` in receiver.cli.simulate), the fake upstream API
(fake_service.py over population.py, served by serve.py), and the one-command demo
(demo.py)."""
