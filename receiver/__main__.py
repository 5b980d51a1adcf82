from receiver.cli import cli

cli()
