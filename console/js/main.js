// The console's pages, once start.js has its settings and the sign-in.
import {forgetPrefetched} from "./api.js";
import {signOut, subject} from "./auth.js";
import {deviceView} from "./device.js";
import {h, replace} from "./dom.js";
import {fleetView} from "./fleet.js";
import {jobView, jobsView} from "./jobs.js";
import {route, start} from "./router.js";
import {started} from "./start.js";

// Pages (a job is created on the fleet page, for its filter).
route("/", fleetView, {nav: "Fleet"});
route("/devices/:id", deviceView);
route("/jobs", jobsView, {nav: "Jobs"});
route("/jobs/:id", jobView);

async function boot() {
  const main = document.getElementById("main");
  try {
    const config = await started;
    document.getElementById("who").textContent = subject();
    const out = document.getElementById("sign-out");
    out.hidden = config.auth.kind === "local";
    out.addEventListener("click", signOut);
    start(main, document.getElementById("nav"));
    forgetPrefetched();
  } catch (error) {
    replace(main, h("h1", {}, "The console could not start"), h("p", {class: "error"}, String(error.message || error)));
  }
}

boot();
