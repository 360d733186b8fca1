// Sign-in for an issuer the console cannot talk to: paste a bearer token it issued.
import {h, replace} from "./dom.js";

/** A pasted token. The first sign-in takes the page (there is none yet); a token asked for
 *  ``again`` (refused, or near its end) is asked for in a dialog over the page, which stays as it
 *  is: what it was doing (an edit, a request held by the renewal) goes on with the new token and
 *  draws its answer where the operator sees it. */
export function askForToken(again) {
  return new Promise((resolve) => {
    const input = h("textarea", {id: "token", rows: 4, required: true, autocomplete: "off", spellcheck: "false"});
    let dialog = null;
    const form = h("form", {class: "panel", on: {submit: (event) => {
      event.preventDefault();
      const value = input.value.trim().replace(/^Bearer\s+/i, "");
      if (!value) return;
      input.value = "";
      if (dialog) {
        dialog.close();
        dialog.remove();
      }
      resolve(value);
    }}},
    h("h1", {id: "token-heading"}, again ? "Your token has expired" : "Sign in"),
    h("p", {}, "Paste a bearer token from the issuer this API trusts. It stays in this tab only."),
    h("label", {for: "token"}, "Bearer token"), input,
    h("p", {}, h("button", {type: "submit"}, "Sign in")));
    if (again) {
      dialog = h("dialog", {id: "token-dialog", "aria-labelledby": "token-heading",
                            on: {cancel: (event) => event.preventDefault()}}, form); // nothing goes on without one
      document.body.append(dialog);
      dialog.showModal();
    } else {
      replace(document.getElementById("main"), form);
    }
    input.focus();
  });
}
