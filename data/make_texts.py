"""Write data/texts.tsv: short product/event reviews labelled with a topic and a sentiment.

Made for this project (nothing downloaded): sentences are assembled from
phrase lists with a seeded RNG, so re-running this script writes the same file.
About one line in eight is "mixed" (a positive and a negative clause); its
label follows the last clause, which a bag of words and word pairs cannot always see,
so the models of notebook 01 make some honest mistakes.

    python data/make_texts.py      # rewrites data/texts.tsv
"""

from __future__ import annotations

import random
from pathlib import Path

SUBJECTS = {
    "sport": ["the match", "the striker", "our team", "the final", "the coach", "the tennis game",
              "the marathon", "the goalkeeper", "the season", "the referee", "the relay race", "the derby"],
    "tech": ["the new phone", "this laptop", "the software update", "the app", "the battery",
             "the camera", "the website", "the chip", "the keyboard", "the cloud service", "the router",
             "the smartwatch"],
    "food": ["the pasta", "this restaurant", "the soup", "the coffee", "the dessert", "the pizza",
             "the curry", "the bakery", "the sushi", "the breakfast", "the street food", "the salad"],
    "travel": ["the flight", "the hotel", "our trip", "the beach", "the train ride", "the museum tour",
               "the airport", "the city centre", "the cruise", "the mountain hike", "the guesthouse",
               "the ferry"],
}
DETAILS = {
    "sport": ["after extra time", "in the second half", "at the stadium", "before the playoffs",
              "on the pitch", "in the league"],
    "tech": ["after the latest patch", "out of the box", "with the new firmware", "on launch day",
             "when charging", "with the beta driver"],
    "food": ["at dinner", "with fresh herbs", "at the corner cafe", "for lunch", "on the menu",
             "with extra spice"],
    "travel": ["on our holiday", "during the long weekend", "in the old town", "despite the delays",
               "by the sea", "at check in"],
}
PREDICATES = {
    "positive": ["was wonderful", "made my day", "was brilliant", "exceeded every expectation",
                 "was a delight", "felt fantastic", "is easily the best so far", "left everyone smiling",
                 "was great value", "worked perfectly", "was excellent", "was a pleasant surprise"],
    "negative": ["was awful", "ruined the evening", "was a total letdown", "felt painfully slow",
                 "was a waste of money", "left me disappointed", "is the worst so far", "broke down again",
                 "was boring", "went terribly", "was a mess", "was frustrating"],
}
LINES_PER_LABEL_PAIR = 50


def make_lines(seed: int = 2026) -> list[tuple[str, str, str]]:
    """Return ``(text, topic, sentiment)`` rows, the same ones for the same seed."""
    rng = random.Random(seed)
    rows = []
    for topic, subjects in SUBJECTS.items():
        for sentiment in PREDICATES:
            other = "negative" if sentiment == "positive" else "positive"
            for i in range(LINES_PER_LABEL_PAIR):
                subject = rng.choice(subjects)
                clause = f"{subject} {rng.choice(PREDICATES[sentiment])} {rng.choice(DETAILS[topic])}"
                if i % 8 == 7:  # mixed review: the last clause decides the label
                    first = f"{rng.choice(subjects)} {rng.choice(PREDICATES[other])}"
                    clause = f"{first}, but {clause}"
                rows.append((clause[0].upper() + clause[1:] + ".", topic, sentiment))
    rng.shuffle(rows)
    return rows


def main() -> None:
    out = Path(__file__).with_name("texts.tsv")
    lines = ["text\ttopic\tsentiment"] + ["\t".join(row) for row in make_lines()]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines) - 1} rows to {out}")


if __name__ == "__main__":
    main()
