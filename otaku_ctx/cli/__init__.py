"""The command line, and the only code that knows Typer and Rich: `app` (the commands and the
one error boundary, `main`), `options` (what the commands share), `terminal` (the streams),
one module per command group, and `views` (what Rich draws)."""
