// The console's start: its settings (config.json beside the page), the sign-in, and the first
// page's listing, sent as soon as the person is signed in. It imports only what that needs, and
// index.html loads it before main.js, so it runs once its few modules are here, while the pages'
// modules still load: the listing no longer waits for every module, then the settings, then the
// token, one after another.
import {configure, prefetch} from "./api.js";
import {signIn} from "./auth.js";
import {fleetAddress, listingQuery} from "./fleet-query.js";

async function settings() {
  const response = await fetch("config.json"); // preloaded by index.html
  if (!response.ok) throw new Error(`config.json: ${response.status}`);
  return response.json();
}

/** The settings, once signed in (main.js shows why not, when this fails). */
export const started = (async () => {
  const config = await settings();
  configure(config);
  await signIn(config);
  const [where, search = ""] = (location.hash || "#/").slice(1).split("?");
  if (where === "/") { // the fleet (main.js's route "/"): its first page
    prefetch("devices", {query: listingQuery(fleetAddress(new URLSearchParams(search)), null)});
  }
  return config;
})();
started.catch(() => {}); // handled by main.js, which may only be evaluated later
