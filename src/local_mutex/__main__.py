try:
    from .cli import main, run_and_exit
except KeyboardInterrupt:  # Ctrl-C before our handlers: nothing ran, no traceback
    raise SystemExit(130) from None

run_and_exit(main)
