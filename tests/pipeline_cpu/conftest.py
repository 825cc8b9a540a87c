"""flashcp and flashcp.torch come from the installed copy (.prefix/venv)."""
