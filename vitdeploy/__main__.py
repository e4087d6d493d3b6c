from vitdeploy.cli import app

app()
