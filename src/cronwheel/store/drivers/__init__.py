"""The drivers under the store, one per database (see ``store/driver.py``)."""
