"""The .prec language: grammar (parser, tables), parse tree with spans and builder (build), diagnostics,
formatter. Import the module you need: importing the package imports none of them, so a verb that only
reports diagnostics (`pcc convert` of a bundle) does not load the grammar (docs/convert.md "Start-up")."""
