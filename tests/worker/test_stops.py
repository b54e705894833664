from __future__ import annotations

from steward.worker.stops import StopMatcher


def feed_all(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    matcher = StopMatcher(stops)
    out = []
    for piece in pieces:
        text, stopped = matcher.feed(piece)
        out.append(text)
        if stopped:
            return "".join(out), True
    return "".join(out) + matcher.flush(), False


def test_stop_across_tokens() -> None:
    assert feed_all(["END"], ["Hello E", "N", "D more"]) == ("Hello ", True)


def test_partial_prefix_is_released() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("a ST") == ("a ", False)
    assert matcher.feed("ay") == ("STay", False)


def test_earliest_of_several() -> None:
    assert feed_all(["b", "a"], ["xxab"]) == ("xx", True)


def test_the_stop_string_that_matched_is_named() -> None:
    matcher = StopMatcher(["b", "a", "zz"])
    assert matcher.matched == ""
    matcher.feed("xx")
    assert matcher.feed("ab") == ("", True)
    assert matcher.matched == "a"  # the earliest in the text, not in the list


def test_no_stops_passes_through() -> None:
    assert feed_all([], ["a", "b"]) == ("ab", False)
