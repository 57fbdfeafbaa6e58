"""The data set: fetched and verified (``fetch``), read and prepared as one tensor file (``prepared``)."""
