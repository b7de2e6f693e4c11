from kagtpl.cli import run

run()
