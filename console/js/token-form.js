// Sign-in for an issuer the console cannot talk to: paste a bearer token it issued.
import {h, replace} from "./dom.js";

export function askForToken(again) {
  return new Promise((resolve) => {
    const input = h("textarea", {id: "token", rows: 4, required: true, autocomplete: "off", spellcheck: "false"});
    const form = h("form", {class: "panel", on: {submit: (event) => {
      event.preventDefault();
      const value = input.value.trim().replace(/^Bearer\s+/i, "");
      if (value) resolve(value);
    }}},
    h("h1", {}, again ? "Your token has expired" : "Sign in"),
    h("p", {}, "Paste a bearer token from the issuer this API trusts. It stays in this tab only."),
    h("label", {for: "token"}, "Bearer token"), input,
    h("p", {}, h("button", {type: "submit"}, "Sign in")));
    replace(document.getElementById("main"), form);
    input.focus();
  });
}
