// The console's start: its settings (config.json beside the page), the sign-in, then the pages.
import {configure} from "./api.js";
import {signIn, signOut, subject} from "./auth.js";
import {deviceView} from "./device.js";
import {h, replace} from "./dom.js";
import {fleetView} from "./fleet.js";
import {jobView, jobsView} from "./jobs.js";
import {route, start} from "./router.js";

// Pages (a job is created on the fleet page, for its filter).
route("/", fleetView, {nav: "Fleet"});
route("/devices/:id", deviceView);
route("/jobs", jobsView, {nav: "Jobs"});
route("/jobs/:id", jobView);

async function boot() {
  const main = document.getElementById("main");
  try {
    const response = await fetch("config.json"); // preloaded by index.html
    if (!response.ok) throw new Error(`config.json: ${response.status}`);
    const config = await response.json();
    configure(config);
    await signIn(config);
    document.getElementById("who").textContent = subject();
    const out = document.getElementById("sign-out");
    out.hidden = config.auth.kind === "local";
    out.addEventListener("click", signOut);
    start(main, document.getElementById("nav"));
  } catch (error) {
    replace(main, h("h1", {}, "The console could not start"), h("p", {class: "error"}, String(error.message || error)));
  }
}

boot();
