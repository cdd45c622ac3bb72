"""The `klgen` command: the binary the wheel carries, run as it is."""

import os
import sys

BINARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "klgen")


def main():
    """Replaces this process with the klgen binary (same arguments, exit status)."""
    if not os.access(BINARY, os.X_OK):
        sys.exit(f"klgen: {BINARY} is missing: the package is not installed whole")
    os.execv(BINARY, [BINARY] + sys.argv[1:])


if __name__ == "__main__":
    main()
