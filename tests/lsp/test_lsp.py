"""`pcc lsp` end to end: a real LSP client (pytest-lsp) starts `python -m pcc.cli lsp`, opens a contract
and gets the same diagnostics `pcc check` reports, hovers, completions, a definition, formatting and
a quick fix."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest_lsp = pytest.importorskip("pytest_lsp", reason="pytest-lsp is in pcc's test extra")
from lsprotocol import types as t  # noqa: E402
from pytest_lsp import ClientServerConfig, LanguageClient  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "contracts" / "unified_fp8.prec"


@pytest_lsp.fixture(config=ClientServerConfig(server_command=[sys.executable, "-m", "pcc.cli", "lsp"]))
async def client(lsp_client: LanguageClient):
    await lsp_client.initialize_session(t.InitializeParams(capabilities=t.ClientCapabilities(),
                                                           root_uri=ROOT.as_uri()))
    yield
    await lsp_client.shutdown_session()


def _open(client: LanguageClient, path: Path, text: str) -> str:
    uri = path.as_uri()
    client.text_document_did_open(t.DidOpenTextDocumentParams(t.TextDocumentItem(uri, "prec", 1, text)))
    return uri


@pytest.mark.asyncio
async def test_diagnostics_are_pcc_checks_with_a_quick_fix(client: LanguageClient, tmp_path):
    """A misspelled scheme: the server publishes pcc check's PCC code at its line, and the code
    action of its did-you-mean hint replaces the word."""
    text = CONTRACT.read_text().replace("linear : fp8_block", "linear : fp8_blokc")
    path = tmp_path / "typo.prec"
    path.write_text(text)
    uri = _open(client, path, text)
    await client.wait_for_notification(t.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    diags = client.diagnostics[uri]
    from pcc.lower import compile_file

    expected = [(d.code, d.span.line) for d in compile_file(str(path)).diagnostics if d.span]
    assert [(d.code, d.range.start.line + 1) for d in diags] == expected and expected
    line = next(i for i, s in enumerate(text.splitlines()) if "fp8_blokc" in s)
    actions = await client.text_document_code_action_async(t.CodeActionParams(
        t.TextDocumentIdentifier(uri), t.Range(t.Position(line, 0), t.Position(line, 1)),
        t.CodeActionContext(diagnostics=diags)))
    edits = [e for a in actions for e in a.edit.changes[uri]]
    assert "fp8_block" in {e.new_text for e in edits}


@pytest.mark.asyncio
async def test_hover_completion_definition_formatting(client: LanguageClient, tmp_path):
    text = CONTRACT.read_text()
    uri = _open(client, CONTRACT, text)
    lines = text.splitlines()
    rule = next(i for i, s in enumerate(lines) if s.strip() == "linear : fp8_block")
    hover = await client.text_document_hover_async(t.HoverParams(t.TextDocumentIdentifier(uri),
                                                                 t.Position(rule, lines[rule].index(":") + 4)))
    assert "rollout.rules[0]" in hover.contents.value and "18,624" in hover.contents.value
    items = await client.text_document_completion_async(t.CompletionParams(t.TextDocumentIdentifier(uri),
                                                                           t.Position(rule, 4)))
    labels = {i.label for i in items.items}
    assert {"keep", "fp8_block", "experts.gate_up", "linear", "mxfp8"} <= labels
    use = next(i for i, s in enumerate(lines) if "gemm : fp8_block" in s)
    loc = await client.text_document_definition_async(t.DefinitionParams(
        t.TextDocumentIdentifier(uri), t.Position(use, lines[use].index("fp8_block") + 2)))
    define = next(i for i, s in enumerate(lines) if s.strip().startswith("scheme fp8_block"))
    assert loc.range.start.line == define
    messy = tmp_path / "messy.prec"
    messy_text = text.replace("  rollout sglang {\n    linear : fp8_block", "  rollout   sglang {\nlinear:fp8_block")
    messy.write_text(messy_text)
    muri = _open(client, messy, messy_text)
    edits = await client.text_document_formatting_async(t.DocumentFormattingParams(
        t.TextDocumentIdentifier(muri), t.FormattingOptions(tab_size=2, insert_spaces=True)))
    assert len(edits) == 1 and edits[0].new_text == text  # pcc fmt's layout: the shipped file, comments kept
