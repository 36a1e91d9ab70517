"""A gate reason's sentence read back: the numbers that a limit on a rate writes as
percentages (service.gate.rules: `NFR 20.27% (95% interval 18.10% – 22.60%) is above the
maximum 3%`) as fractions, for a test to check against the decision's fields or numpy."""

import re

PERCENT = r"(-?[0-9.]+)%"
RATE_REASON = re.compile(rf"{PERCENT}(?: \(95% interval {PERCENT} – {PERCENT}\))? is "
                         rf"(?:above the maximum|below the minimum) {PERCENT}")


def rate_figures(message: str) -> tuple[float, list[float] | None, float]:
    """The measured rate, its 95% interval (None where the sentence gives none) and the
    limit that `message` writes, as fractions."""
    found = RATE_REASON.search(message)
    assert found, message
    measured, low, high, limit = (None if text is None else float(text) / 100
                                  for text in found.groups())
    return measured, None if low is None else [low, high], limit
