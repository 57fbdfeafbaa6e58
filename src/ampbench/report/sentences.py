"""The language of a findings report: English (docs/FINDINGS.md) or Chinese (docs/FINDINGS.zh.md).

The tutorial the project answers was written in Chinese for Chinese readers, so `ampbench
findings` writes both editions from the same results in one run. The report's code builds every
figure once, as text, and hands it to :class:`Words`, which puts it in the edition's sentence
(sentences_en.py, sentences_zh.py: the same keys and the same fields). So the editions cannot disagree on a
number; a test checks they hold the same ones.
"""

from __future__ import annotations

from ampbench.report.sentences_en import EN
from ampbench.report.sentences_zh import ZH, ZH_NAMES

LANGUAGES = ("en", "zh")
_SENTENCES = {"en": EN, "zh": ZH}
# Words the code compares or parses, in English, as each edition shows them (English: as they are).
_NAMES = {"zh": ZH_NAMES}
_SEPARATORS = {"zh": {", ": "、", "; ": "；", " ": ""}}


class Words:
    """One edition's sentences: ``words("key", field=text, ...)``; ``words.name(english)`` for a
    study label, verdict or claim (the code keeps comparing the English ones)."""

    def __init__(self, lang: str = "en") -> None:
        if lang not in LANGUAGES:
            raise ValueError(f"report language {lang!r}: not one of {', '.join(LANGUAGES)}")
        self.lang = lang
        self.sentences = _SENTENCES[lang]

    def __call__(self, key: str, **fields: object) -> str:
        return self.sentences[key].format(**fields)

    def name(self, english: str) -> str:
        """The edition's words for an English study label, verdict, claim or ladder rung's change
        (as it stands where the edition has none: a rung explain.json names otherwise)."""
        return _NAMES.get(self.lang, {}).get(english, english)

    def list(self, items, sep: str = ", ") -> str:
        """Items joined as the edition writes a list: English ", ", "; ", " " (between sentences);
        Chinese "、", "；" and nothing."""
        return _SEPARATORS.get(self.lang, {}).get(sep, sep).join(items)

    def source(self, name: str) -> str:
        """An input of the report (study, tutorial, bench, explain) as the edition names it."""
        return self.sentences.get(f"source.{name}", name)


ENGLISH = Words("en")
