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
    assert _words(text) == ["x"] + ["--lora-rank", "8", "--lora-alpha", "16"] * 2 + ["$(clean)", "$(nproc)"]
    assert [raw for raw, _ in e.unexpanded] == ["$(clean)", "$(nproc)"]


def test_a_script_run_without_arguments():
    """verl's examples end in `"${EXTRA[@]}" "$@"`: an empty array and no arguments give no word
    (bash -c 'A=(); printf "<%s>" x "${A[@]}" "$@" ""' prints <x><>), `$1` is unset."""
    text = 'A=(\n)\nx "${A[@]}" "$@" $* "" "${A[@]}y" $# ${1:-vllm} "$1"\n'
    assert _words(text) == ["x", "", "y", "0", "vllm", ""]


def test_the_word_of_a_default_is_expanded():
    """`${V:-word}`: word is expanded as bash does (verl: `${MAX_PROMPT_LENGTH:-$((1024 * 2))}`,
    `${RAY_DATA_HOME:-"${HOME}/verl"}`); `:=` assigns it, `:+` gives it only when set."""
    text = ('H=/h\nE=\nX=${X:-"${H}/verl"}\nP=${P:-$((1024 * 2))}\n'
            'x $X $P ${E:-e} ${E-e} ${Z:=q} $Z ${Z:+on} ${W:+no}. ${N:-$(date +%s)}\n')
    e = expand(text)
    assert _words(text) == ["H=/h", "E=", "X=/h/verl", "P=2048", "x", "/h/verl", "2048", "e", "q", "q", "on", ".",
                            "${N:-$(date +%s)}"]  # a word part of which stays as written stays whole
    assert [raw for raw, _ in e.unexpanded] == ["${N:-$(date +%s)}"]


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


def test_a_function_body_runs_where_it_is_called():
    """Miles' multi-node profile scripts define their flag arrays and `ray job submit` inside
    `run_mode() { local mode="$1"; ... }` and call `run_mode "$MODE"`: the body's words, with the
    call's arguments as `$1`, `"$@"`; a function that calls itself runs once."""
    text = ('f() {\n  local m="$1"\n  A=(--x $m)\n  run "${A[@]}" "$@" $#\n}\nf one two\nf\n'
            'g() { g; echo in-g; }\ng\n')
    assert _words(text) == ["local", "m=one", "run", "--x", "one", "one", "two", "2",
                            "local", "m=", "run", "--x", "0", "g", "echo", "in-g"]


def test_if_takes_the_branch_bash_takes():
    """verl's examples pick overrides by `if [ "${DEVICE}" = npu ]; then ... elif [ -n "${ROLLOUT_DP}" ]`:
    a test of known values picks one branch (as `bash -c` does); a test that runs a command reads
    every branch and is reported."""
    text = ('D=gpu\nX=\nif [ "${D}" = npu ]; then\n  A=(npu)\nelif [ -n "${X}" ]; then\n  A=(x)\nelse\n'
            '  A=(other)\n  if [[ 1 -eq 1 ]]; then B=in; fi\nfi\nif command -v foo; then C=1; else C=2; fi\n'
            'if ! test "$D" != gpu; then E=neg; fi\necho ${A[@]} $B $C $E\n')
    e = expand(text)
    assert [w for w, _ in e.words if w != SEP][-5:] == ["echo", "other", "in", "2", "neg"]
    assert [raw for raw, _ in e.unexpanded] == ["if command -v foo"]
    with pytest.raises(ShellError):
        expand("if [ 1 ]; then a\n")


def test_here_documents_are_text_not_words():
    """Miles' multi-teacher OPD script feeds Python to `python3 - << 'PYEOF'`: its `if`s and quotes
    are the document's, not the script's; `<<-` strips leading tabs from the closing line."""
    text = "python3 - << 'PY'\nif x: print('a\nPY\ncat <<-END >f\n\tif\n\tEND\nafter --x 1\n"
    assert _words(text) == ["python3", "-", "<< 'PY'", "cat", "<<-END", ">f", "after", "--x", "1"]
    with pytest.raises(ShellError):
        expand("cat <<EOF\nno end\n")
