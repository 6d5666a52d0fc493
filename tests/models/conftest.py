import pytest
import torch


@pytest.fixture(autouse=True)
def single_thread():
    """One intra-op thread: pinned values do not depend on the thread count, and on a shared
    2-core machine extra threads mostly spin. Restored afterwards for other test packages."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
