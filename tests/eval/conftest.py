import pytest

from eval.grading import Grader


@pytest.fixture(scope="session")
def grader():
    """One math-verify worker for the grading tests (the timeout tests make their own)."""
    g = Grader(timeout_s=5.0)
    yield g
    g.close()
