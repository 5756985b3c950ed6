"""The batch job as a script: ``python pipelines/batch.py --help``, the same as ``streameval batch --help``.
Its logic is :mod:`streameval.jobs.batch` (installed with the package); this folder is not."""
import sys

from streameval.cli import main

if __name__ == "__main__":
    sys.exit(main(["batch", *sys.argv[1:]]))
