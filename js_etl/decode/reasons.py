"""The dead-letter reasons (``error``) every decoder gives, spelled once."""

NOT_UTF8 = "payload is not valid UTF-8"
EMPTY = "empty payload"
MALFORMED = "malformed JSON"
NOT_JSON = "payload is not JSON"
WHITESPACE = "payload is only whitespace: no JSON value"
TRAILING = "data after the JSON value: a payload must be exactly one JSON value"
ARRAY = "payload is a JSON array: decode.schema describes one JSON object per message"
# Reasons with a part taken from the payload, where "{}" stands.
SEVERAL = "payload holds {} JSON values: a payload must be exactly one JSON value"
NO_FIELD = ("JSON object has none of decode.schema's fields (it has: {}); fix decode.schema, or "
            "set decode.keep_raw to keep such payloads in the row")

# One rule in every decoder: a payload that is not one JSON value (nor values separated by
# commas) is "malformed JSON", or "data after the JSON value", only when it starts (after
# whitespace) like a JSON document, an object or an array; else it is text, "payload is not
# JSON" ("hello", "false alarm", "7 apples").
DOCUMENT_STARTS = ("{", "[")
