// Following one device over the WebSocket, as docs/api/feed-and-push.md asks of a client:
// the token goes as a subprotocol (never in the URL); every version after the last one kept
// is handed on once, in order: repeats are dropped, a gap is filled from the change feed, and
// after any disconnect the follower connects again (backing off, with jitter) and subscribes
// from the last version it kept.
import {path, request} from "./api.js";
import {renew, token} from "./auth.js";
import {parse} from "./json.js";

const PING_MS = 5 * 60e3; // API Gateway closes a connection idle for 10 minutes
const BACKOFF_MS = [250, 500, 1000, 2000, 4000, 8000];

export class Follower {
  /**
   * onChange(change): each change after `since`, once, in order.
   * onStatus("live" | "connecting" | "offline", detail): the connection's state.
   * onResync(): the changes since the last version kept are past the retention: read the device again.
   */
  constructor({url, deviceId, since, onChange, onStatus = () => {}, onResync = () => {}}) {
    Object.assign(this, {url, deviceId, last: since, onChange, onStatus, onResync});
    this.stopped = false;
    this.failures = 0;
    this.queue = Promise.resolve(); // changes are handled one at a time, in arrival order
  }

  start() {
    this.connect();
    return this;
  }

  stop() {
    this.stopped = true;
    clearInterval(this.pinger);
    clearTimeout(this.retry);
    this.socket?.close(1000, "page left");
  }

  async connect() {
    if (this.stopped) return;
    this.onStatus("connecting");
    let bearer;
    try {
      bearer = await token();
    } catch (error) {
      return this.later(error.message);
    }
    const socket = new WebSocket(this.url, ["device-state", `bearer.${bearer}`]);
    this.socket = socket;
    let opened = false;
    socket.addEventListener("open", () => {
      opened = true;
      socket.send(JSON.stringify({action: "subscribe", deviceId: this.deviceId, since: this.last}));
      this.pinger = setInterval(() => socket.send(JSON.stringify({action: "ping"})), PING_MS);
    });
    socket.addEventListener("message", (event) => {
      let message;
      try {
        message = parse(event.data);  // as a read's answer: numbers keep their digits
      } catch {
        return;
      }
      this.queue = this.queue.then(() => this.receive(message)).catch((error) => console.error(error));
    });
    socket.addEventListener("close", () => {
      clearInterval(this.pinger);
      if (this.socket !== socket || this.stopped) return;
      if (!opened) this.failures += 1;
      this.later(opened ? "connection closed" : "could not connect");
    });
  }

  later(reason) {
    if (this.stopped) return;
    const wait = BACKOFF_MS[Math.min(this.failures, BACKOFF_MS.length - 1)];
    this.onStatus("offline", reason);
    this.retry = setTimeout(() => this.connect(), wait / 2 + Math.random() * wait / 2);
  }

  async receive(message) {
    if (message.type === "subscribed") {
      this.failures = 0;
      this.onStatus("live");
    } else if (message.type === "change" && message.deviceId === this.deviceId) {
      if (message.version <= this.last) return; // a repeat (the catch-up and the fan-out may both send it)
      if (message.previousVersion > this.last) await this.fill(message.previousVersion);
      if (message.version <= this.last) return;
      this.last = message.version;
      this.onChange(message);
    } else if (message.type === "error") {
      const problem = message.problem || {};
      if (String(problem.type).endsWith(":changes-expired")) { // what it missed is past the retention
        this.onResync(problem.currentVersion);
      } else if (problem.status === 401) { // the token the connection was opened with expired
        await renew().catch(() => {});
        this.socket?.close(4000, "token renewed");
      } else if (problem.status >= 500 || problem.status === 429) { // connect again, from the last version kept
        this.failures += 1; // backed off as a refused connect is
        this.socket?.close(4002, "asked to subscribe again");
      } else {
        this.onStatus("offline", problem.detail || problem.title || "refused");
      }
    }
  }

  /** The changes between the last kept and `upTo` (a message skipped one), from the change feed. */
  async fill(upTo) {
    for (let empty = 0; this.last < upTo && empty < 10;) {
      const answer = await request("GET", `devices/${path(this.deviceId)}/changes`,
                                   {query: {since: this.last, limit: Math.min(upTo - this.last, 100)}});
      if (String(answer.problem?.type).endsWith(":changes-expired")) return this.onResync(answer.problem.currentVersion);
      const changes = answer.ok ? answer.data.changes : [];
      if (!changes.length) { // the feed trails the push by a moment: ask again shortly
        empty += 1;
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
      for (const change of changes) {
        if (change.version > this.last && change.version <= upTo) {
          this.last = change.version;
          this.onChange(change);
        }
      }
    }
  }

  /** After a resync: go on from the version just read. */
  resume(version) {
    this.last = version;
    this.socket?.close(4001, "resynced");
  }
}
