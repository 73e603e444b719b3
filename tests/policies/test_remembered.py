from brim.policies.remembered import Remembered


def test_it_forgets_the_least_recently_used_first() -> None:
    cache: Remembered[tuple[str, int, int], int] = Remembered(maxsize=2)
    cache[("a", 1, 1)] = 1
    cache[("b", 1, 1)] = 2
    assert cache.get(("a", 1, 1)) == 1  # now the most recent
    cache[("c", 1, 1)] = 3
    assert len(cache) == 2
    assert cache.get(("b", 1, 1)) is None
    assert (cache.get(("a", 1, 1)), cache.get(("c", 1, 1))) == (1, 3)
