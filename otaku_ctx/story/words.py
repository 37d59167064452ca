"""The words of a story's text, as ctx's text checks and rankings read them: a word (`WORD`),
a number (`NUMBER`), and the English function words that tell nothing of what a text is about
(`STOPWORDS`)."""

from __future__ import annotations

import re

WORD = re.compile(r"\w+(?:['’]\w+)*", re.UNICODE)
NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
# Words that tell nothing of a scene: too common to count as the scene's own.
STOPWORDS = frozenset(
    """a about after again all also an and any are as at be because been before being but by can
    could did do does each even ever every for from had has have he her here hers him his how i if
    in into is it its just like made make many may me more most much must my never no not now of
    off on once one only or other our out over own said same she should so some still such than
    that the their them then there these they this those through to too under until up upon very
    was we were what when where which while who whom why will with would you your scene story
    summary history recap""".split()
)
