"""``python -m audit ...`` (and ``torchrun --nproc-per-node N -m audit train CONFIG``): the same CLI as the
``audit`` command."""

from audit.cli import main

if __name__ == "__main__":
    main(prog_name="audit")
