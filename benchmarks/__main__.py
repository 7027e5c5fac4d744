from benchmarks.cli import app

app()
