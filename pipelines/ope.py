"""The ope job as a script: ``python pipelines/ope.py --help``, the same as ``streameval ope --help``.
Its logic is :mod:`streameval.jobs.ope` (installed with the package); this folder is not."""
import sys

from streameval.cli import main

if __name__ == "__main__":
    sys.exit(main(["ope", *sys.argv[1:]]))
