"""Pairing two dumps: `paired.read_pair` reads both sides and matches their records (`matching`: by module path,
then by content, type and shape in the gaps; `ops`: op-level records), `paired.check_same_model` refuses two dumps
of different models. Compare, replay and repro take their pairs from here; none pairs dumps another way."""
