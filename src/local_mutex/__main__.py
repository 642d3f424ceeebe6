from .cli import main, run_and_exit

run_and_exit(main)
