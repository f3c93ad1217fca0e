"""``python -m audit ...``: the same CLI as the ``audit`` command."""

from audit.cli import main

main(prog_name="audit")
