"""``python -m toolchain`` is the same as the ``hydra-toolchain`` console script."""

from toolchain.cli import main

if __name__ == "__main__":
    main()
