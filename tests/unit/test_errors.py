"""js_etl.errors.one_line: another library's error text on the one line a js-etl error has."""

from js_etl.errors import one_line


def test_deltalakes_chain_of_causes_is_joined_on_one_line_without_colour_codes():
    # As deltalake 1.6 words an object store's failure during a commit.
    error = OSError("Generic S3 error\n          \x1b[31m↳\x1b[0m Error performing PUT "
                    "http://127.0.0.1:1/b/t/_delta_log/00000000000000000001.json in 708µs - HTTP "
                    "error\n           \x1b[31m↳\x1b[0m error sending request\n")

    assert one_line(error) == (
        "OSError: Generic S3 error Error performing PUT "
        "http://127.0.0.1:1/b/t/_delta_log/00000000000000000001.json in 708µs - HTTP error "
        "error sending request")


def test_a_long_text_is_cut():
    assert len(one_line(ValueError("x" * 1000), limit=50)) == 50
