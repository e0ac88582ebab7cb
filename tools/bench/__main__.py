"""``python -m tools.bench [--quick] [--messages N,..] [--size B,..] [--memory-check]
[--cluster 1,2,4] [--json PATH]`` (``make bench``)."""

import logging
import sys

from tools.bench.cli import main

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("js_etl").setLevel(logging.INFO)
    sys.exit(main())
