"""One folder per API family: its request models (`protocol.py`), its serving code and its
routes (`routes.py`) side by side. Each module keeps the layer its name says: the layering
test treats `protocol.py` as protocol/, `routes.py` as api/, anything else as serving/."""
