#!/usr/bin/env bash
# docs/config-reference.md is what `strata config --list --markdown` prints, so the reference
# stays true to the schema the YAML loader reads; and `strata config --list` names every key.
# Usage: config_reference_test.sh PATH/TO/strata PATH/TO/docs/config-reference.md
set -u
strata="$1"
doc="$2"
generated=$("$strata" config --list --markdown) || { echo "FAIL: strata config --list --markdown failed"; exit 1; }
if ! diff -u "$doc" <(printf '%s\n' "$generated"); then
  echo "FAIL: $doc differs from the schema; regenerate it with"
  echo "  build/bin/strata config --list --markdown > docs/config-reference.md"
  exit 1
fi
listed=$("$strata" config --list) || { echo "FAIL: strata config --list failed"; exit 1; }
# The table's keys (first column, in backquotes) and the text list's (first word) agree.
doc_keys=$(grep -o '^| `[^`]*`' "$doc" | sed 's/^| `//; s/`$//')
list_keys=$(tail -n +2 <<<"$listed" | awk '{print $1}')
if [ "$doc_keys" != "$list_keys" ] || [ -z "$doc_keys" ]; then
  echo "FAIL: the text list and the Markdown table name different keys"
  diff <(echo "$doc_keys") <(echo "$list_keys")
  exit 1
fi
echo "ok: $(wc -l <<<"$doc_keys") keys, docs/config-reference.md matches the schema"
