"""The product suite's leak checks, for the benchmark tools' tests too."""
from tests.conftest import no_leaks, unrelated_shm  # noqa: F401 - fixtures
