"""The typed word-to-word relations the built-in corpus knows, on both sides.

Every pair carries ``zh_relations`` and ``en_relations``, gold triples recorded by the
renderer (:mod:`tinymt.corpus.render`; their format and the table: docs/corpus.md,
"Relations"). A constituent of several words links each of its words ("Li Lei"
-> "asked" gives two triples), and a relation appears on one side only when both ends
are words of that side (English past tense lives in the verb itself: 了 -> 买 has no
English triple, "did" -> "buy" has no Chinese one).
"""

from __future__ import annotations

# name -> (what it links, dependent -> head, a Chinese and an English example)
RELATION_DOCS: dict[str, tuple[str, str, str]] = {
    "subject": ("the subject's words -> the predicate (verb, or the adjective of 很-clauses)",
                "我 -> 请", "I -> asked"),
    "object": ("an object (direct, indirect, the place after 去 / go to, a fronted what) "
               "-> its verb", "机票 -> 订", "ticket -> book"),
    "aux": ("a tense/aspect marker or auxiliary (了 正在 会; do/does/did, am/is/are, will) "
            "-> its verb", "会 -> 去", "will -> go"),
    "negation": ("不 / 没 / not -> the verb or adjective", "没 -> 去", "not -> go"),
    "determiner": ("numeral, demonstrative, measure word, article -> its noun",
                   "只 -> 猫", "this -> cat"),
    "adjective": ("an attributive adjective -> its noun", "可爱 -> 猫", "cute -> cat"),
    "possessive": ("the possessor -> the possessed noun", "李雷 -> 书", "Lei's -> book"),
    "relative": ("the verb of a 的-relative clause (or 去 / to of 去X的N) -> the noun it "
                 "modifies", "买 -> 书", "bought -> book"),
    "time": ("a time word -> the verb", "昨天 -> 追", "yesterday -> chased"),
    "place": ("the place of 在…里 / where -> the verb", "公园 -> 追", "park -> chased"),
    "pivot": ("the person asked / let / helped (请 叫 教 让 帮 X …) -> that verb",
              "李雷 -> 请", "Lei -> asked"),
    "question": ("吗 / the fronted auxiliary of a yes-no question -> the verb",
                 "吗 -> 喜欢", "Does -> like"),
}
RELATIONS: tuple[str, ...] = tuple(RELATION_DOCS)

