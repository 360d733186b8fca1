// JSON as the service keeps it: numbers exact (a number JavaScript would round is kept as its
// own digits, JSON.rawJSON, so it is shown and sent back as stored), paths as JSON Pointers.

const exact = typeof JSON.rawJSON === "function";

/** JSON.parse, keeping every number of more digits than a double holds (16 or more significant). */
export function parse(text) {
  return JSON.parse(text, (_key, value, context) =>
    exact && typeof value === "number" && typeof context?.source === "string" && significant(context.source) > 15
      ? JSON.rawJSON(context.source) : value);
}

function significant(source) {
  const mantissa = source.replace(/^-/, "").split(/[eE]/)[0].replace(".", "");
  return mantissa.replace(/^0+/, "").replace(/0+$/, "").length;
}

export function isRaw(value) {
  return exact && JSON.isRawJSON(value);
}

export function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value) && !isRaw(value);
}

// What changes how the text beside it is drawn (bidi controls: U+202E turns "15" into "51") or is
// not drawn at all (zero-width spaces, the soft hyphen): never shown as itself. Zero-width
// (non-)joiners are: Persian and Indic words and emoji sequences are spelled with them.
const UNSEEN = /[\u00ad\u061c\u180e\u200b\u200e\u200f\u2028\u2029\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]/g;

/** A string as the console shows it: each bidi control or zero-width character as its escape (\u202e). */
export function visible(string) {
  return String(string).replace(UNSEEN, (character) => `\\u${character.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

/** A value as one line of JSON text (what a leaf shows), its unseen characters as JSON escapes. */
export function text(value) {
  return visible(JSON.stringify(value));
}

export function pretty(value) {
  return JSON.stringify(value, null, 2);
}

export function pointer(segments) {
  return segments.map((segment) => "/" + String(segment).replaceAll("~", "~0").replaceAll("/", "~1")).join("");
}

/** The segments of a declared field's path, as FLEET_INDEX writes it: reported/a~1b -> ["reported", "a/b"]. */
export function fieldSegments(path) {
  return path.split("/").map((segment) => segment.replaceAll("~1", "/").replaceAll("~0", "~"));
}

export function at(document, segments) {
  let node = document;
  for (const segment of segments) {
    if (!isObject(node) || !Object.hasOwn(node, segment)) return undefined;
    node = node[segment];
  }
  return node;
}

/** The leaves of a document by JSON Pointer (an empty object is a leaf, as the service counts them). */
export function leaves(value, segments = [], out = new Map()) {
  if (isObject(value) && Object.keys(value).length) {
    for (const name of Object.keys(value)) leaves(value[name], [...segments, name], out);
  } else if (value !== undefined) {
    out.set(pointer(segments), value);
  }
  return out;
}

/** Every leaf that differs between two documents, by path: [{path, before, after}], undefined where absent. */
export function diff(before, after) {
  const old = leaves(before), now = leaves(after);
  // An empty object that gained members (or members that left one empty) is said by its members alone.
  const parents = (paths) => new Set([...paths.keys()].flatMap((path) =>
    [...path.matchAll(/\//g)].map((slash) => path.slice(0, slash.index))));  // "" for the root
  const oldParents = parents(old), nowParents = parents(now);
  return [...new Set([...old.keys(), ...now.keys()])].sort()
    .filter((path) => text(old.get(path)) !== text(now.get(path)))
    .filter((path) => !((isEmpty(old.get(path)) && nowParents.has(path)) || (isEmpty(now.get(path)) && oldParents.has(path))))
    .map((path) => ({path, before: old.get(path), after: now.get(path)}));
}

function isEmpty(value) {
  return isObject(value) && !Object.keys(value).length;
}
