from kagtpl.cli import app

app(prog_name="kagtpl")
