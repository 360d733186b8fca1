"""The fleet's stated limits, apart from the modules that keep them, so that the routes can
declare them without loading the query, RQL and listing code, which a request loads only when
it lists or queries (see docs/decisions.md on cold starts)."""

MAX_LIMIT = 100  # devices in a fleet query's page
MAX_LIST_LIMIT = 100  # devices in a plain listing's page
MAX_FILTER_CHARS = 4096
MAX_COUNT_INDEX_ENTRIES = 500_000
MAX_COUNT_ITEMS = 1_000
