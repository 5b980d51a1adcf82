import gc

from receiver.cli import cli

try:
    cli()
finally:
    # The process ends here: the interpreter's last collections would walk every object the
    # app still holds only to free memory that the exit frees anyway (docs/performance.md).
    gc.freeze()
