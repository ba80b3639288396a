"""pcc/importer/shell.py: a launch script's words as bash expands them, nothing run."""

from __future__ import annotations

import pytest

from pcc.importer.shell import SEP, MAX_WORDS, Arith, ShellError, expand


def _words(text: str) -> list[str]:
    return [w for w, _ in expand(text).words if w != SEP]


def test_arrays_quoted_and_unquoted():
    text = 'FP8=(\n  --fp8-format e4m3  # the format\n  --fp8-recipe blockwise\n)\nFP8+=(--x)\n' \
           'python3 train.py "${FP8[@]}" ${FP8[@]} "${FP8[*]}" ${#FP8[@]}\n'
    assert _words(text) == ["python3", "train.py"] + ["--fp8-format", "e4m3", "--fp8-recipe", "blockwise", "--x"] * 2 \
        + ["--fp8-format e4m3 --fp8-recipe blockwise --x", "5"]


def test_variables_in_words_defaults_and_quotes():
    text = ('BASE_DIR=/root/base\nexport NAME="a b"\nx --load "${BASE_DIR}/ckpt" --n $NAME "$NAME" '
            "'$BASE_DIR' ${TP:-4} ${BASE_DIR:-/other} \"\" ${EMPTY_ARR}\n")
    e = expand(text)
    assert [w for w, _ in e.words if w != SEP] == ["BASE_DIR=/root/base", "export", "NAME=a b", "x", "--load",
                                                  "/root/base/ckpt", "--n", "a", "b", "a b", "$BASE_DIR", "4",
                                                  "/root/base", "", "${EMPTY_ARR}"]
    assert e.unexpanded == [("${EMPTY_ARR}", text.index("${EMPTY_ARR}"))]


def test_arithmetic_over_assigned_names():
    text = "TP=4\nPP=$((TP / 2))\nx $((TP * PP + (3 % 2))) $(( -7 / 2 )) $((-7 % 2)) $((TP + UNSET)) $((1/0)) $((2 ** 3))\n"
    e = expand(text)
    assert _words(text) == ["TP=4", "PP=2", "x", "9", "-3", "-1", "$((TP + UNSET))", "$((1/0))", "$((2 ** 3))"]
    assert [raw for raw, _ in e.unexpanded] == ["$((TP + UNSET))", "$((1/0))", "$((2 ** 3))"]


def test_arithmetic_is_bounded():
    with pytest.raises(ValueError):
        Arith("A", {"A": "A"}).value()  # a name defined by itself: nesting limit, not a recursion error
    with pytest.raises(ValueError):
        Arith("9" * 30, {}).value()


def test_functions_that_echo_flags_and_other_commands():
    text = ('lora() {\n  echo "--lora-rank 8"\n  echo --lora-alpha 16\n}\nfunction clean { rm -rf /tmp/x; }\n'
            'x $(lora) `lora` $(clean) $(nproc) "$@"\n')
    e = expand(text)
    assert _words(text) == ["x"] + ["--lora-rank", "8", "--lora-alpha", "16"] * 2 + ["$(clean)", "$(nproc)", "$@"]
    assert [raw for raw, _ in e.unexpanded] == ["$(clean)", "$(nproc)", "$@"]


def test_statements_operators_and_continuations():
    text = "a --x 1 \\\n  --y 2 && b; c | d > out.log 2>&1\n"
    assert [w for w, _ in expand(text).words] == ["a", "--x", "1", "--y", "2", "&&", "b", SEP, "c", "|", "d",
                                                  ">", "out.log", "2>&1", SEP]


@pytest.mark.parametrize("text", ["x 'open", 'x "open', "x $(open", "x ${open"])
def test_unterminated_is_an_error(text):
    with pytest.raises(ShellError):
        expand(text)


def test_expansion_is_bounded():
    text = "A=(" + "x " * 1000 + ")\n" + "y " + '"${A[@]}" ' * (MAX_WORDS // 1000 + 1)
    with pytest.raises(ShellError):
        expand(text)


@pytest.mark.parametrize("text", ["A=(x)\n" + "A=(\"${A[@]}\" \"${A[@]}\")\n" * 20,
                                  "A=xxxxxxxx\n" + "A=$A$A\n" * 20,
                                  "f() { echo $(f); }\nx $(f)\n"])
def test_doubling_and_recursion_are_bounded(text):
    with pytest.raises(ShellError):
        expand(text)
