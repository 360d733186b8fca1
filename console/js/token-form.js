// Sign-in for an issuer the console cannot talk to: paste a bearer token it issued. And the
// dialog that asks before the page leaves for a sign-in it cannot do silently.
import {h, replace} from "./dom.js";

/** A pasted token. The first sign-in takes the page (there is none yet); a token asked for
 *  ``again`` (refused, or at its end) is asked for in a dialog over the page, which stays as it
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
      dialog?.close();
      dialog?.remove();
      resolve(value);
    }}},
    h("h1", {id: "token-heading"}, again ? "Your token has expired" : "Sign in"),
    h("p", {}, "Paste a bearer token from the issuer this API trusts. It stays in this tab only."),
    h("label", {for: "token"}, "Bearer token"), input,
    h("p", {}, h("button", {type: "submit"}, "Sign in")));
    if (again) {
      dialog = modal(form);
    } else {
      replace(document.getElementById("main"), form);
    }
    input.focus();
  });
}

/** Resolves once the operator chooses to leave for the sign-in page (a hosted UI with no refresh
 *  token left, after a reload): the page does not leave by itself, under an edit being typed. */
export function askToSignInAgain() {
  return new Promise((resolve) => {
    const button = h("button", {type: "submit"}, "Sign in again");
    const dialog = modal(h("form", {class: "panel", on: {submit: (event) => {
      event.preventDefault();
      dialog.close();
      dialog.remove();
      resolve();
    }}},
    h("h1", {id: "token-heading"}, "Your sign-in has ended"),
    h("p", {}, "Nothing more is sent until you sign in again. Signing in leaves this page and comes back to it: "
      + "copy anything you typed and have not applied first."),
    h("p", {}, button)));
    button.focus();
  });
}

function modal(form) {
  const dialog = h("dialog", {id: "token-dialog", "aria-labelledby": "token-heading",
                              on: {cancel: (event) => event.preventDefault()}}, form); // nothing goes on without it
  document.body.append(dialog);
  dialog.showModal();
  return dialog;
}
