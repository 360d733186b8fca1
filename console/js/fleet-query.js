// The fleet page's address (#/?filter=…&sort=…&limit=…&groupBy=…) and the listing it asks for.
// Apart from fleet.js, with no imports, so that the console's start (start.js) can send the first
// page's listing while the pages' modules still load.

const DEFAULT_LIMIT = 25;

/** What the fleet page's address asks for. */
export function fleetAddress(query) {
  return {filter: query.get("filter") || "", sort: query.get("sort") || "",
          limit: /^(100|[1-9][0-9]?)$/.test(query.get("limit") || "") ? Number(query.get("limit")) : DEFAULT_LIMIT,
          groupBy: query.get("groupBy") || ""};
}

/** The filter and sort sent: sorting needs a filter, so a sort alone lists those that hold the field. */
export function effective({filter, sort}) {
  const sortPath = sort.replace(/^[+-]/, "");
  if (filter || !sortPath) return {filter, sort};
  return {filter: `exists(${sortPath})`, sort, implied: sortPath};
}

/** The query of GET /devices for one page of the listing (cursor null: the first). */
export function listingQuery(address, cursor) {
  const {filter, sort} = effective(address);
  return {filter, sort, limit: address.limit, cursor};
}
