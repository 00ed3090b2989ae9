import pytest

from ext_proc.core.budget import Budget


def test_acquire_up_to_the_limit_and_release():
    budget = Budget(10)
    assert budget.try_acquire(6)
    assert not budget.try_acquire(5)  # 11 > 10: refused, nothing taken
    assert budget.used == 6
    assert budget.try_acquire(4)
    assert (budget.used, budget.peak) == (10, 10)
    budget.release(10)
    assert (budget.used, budget.peak) == (0, 10)  # the peak stays
    assert budget.try_acquire(0)


@pytest.mark.parametrize("size", [-1, 4])
def test_releasing_what_was_not_held_is_a_bug(size):
    budget = Budget(10)
    budget.try_acquire(3)
    with pytest.raises(ValueError, match="releasing"):
        budget.release(size)
    assert budget.used == 3


def test_a_negative_reservation_is_a_bug():
    with pytest.raises(ValueError, match="negative"):
        Budget(10).try_acquire(-1)
