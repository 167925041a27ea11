// The answer form of a task that waits for input (docs/waits.md): built from the wait's JSON
// Schema, it sends tasks.respond. One field for the whole answer: a string is a text input, a
// number or integer a number input, a boolean a checkbox, an enum a select; an object, anything
// else, or no schema, a JSON text area. The service checks the answer against the schema; its
// refusal (-32602, naming the problem) is shown under the form.

import {call} from "./api.js";
import {h} from "./dom.js";

// The field for `schema` and how to read the answer out of it (throws Error for bad JSON).
function field(schema) {
  const attrs = {name: "value", "data-testid": "answer-value"};
  if (schema && Array.isArray(schema.enum)) {
    const select = h("select", attrs, schema.enum.map((option, index) =>
      h("option", {value: String(index)}, typeof option === "string" ? option : JSON.stringify(option))));
    return [select, () => schema.enum[Number(select.value)]];
  }
  const type = schema && schema.type;
  if (type === "string") {
    const input = h("input", {...attrs, type: "text"});
    return [input, () => input.value];
  }
  if (type === "number" || type === "integer") {
    const input = h("input", {...attrs, type: "number", step: type === "integer" ? "1" : "any"});
    return [input, () => (input.value === "" ? null : Number(input.value))];  // empty: the service says why not
  }
  if (type === "boolean") {
    const input = h("input", {...attrs, type: "checkbox"});
    return [input, () => input.checked];
  }
  const area = h("textarea", {...attrs, rows: 5, spellcheck: "false",
                               placeholder: schema ? `JSON matching ${JSON.stringify(schema)}` : "any JSON value"});
  return [area, () => {
    try {
      return JSON.parse(area.value);
    } catch (error) {
      throw new Error(`The answer is not valid JSON: ${error.message}`);
    }
  }];
}

// The form for `task` (its `waiting` is {kind: "input", prompt, schema, ...}); onAnswered() once
// the service took the answer.
export function answerForm(task, onAnswered) {
  const wait = task.waiting;
  const [input, read] = field(wait.schema);
  const problem = h("p", {class: "answer-error", "data-testid": "answer-error", hidden: true});
  const send = h("button", {type: "submit", "data-testid": "answer-send"}, "Answer");
  const form = h("form", {class: "answer", "data-testid": "answer-form"},
    h("p", {class: "prompt", "data-testid": "answer-prompt"}, wait.prompt || "This task waits for an answer."),
    h("label", {}, input),
    wait.schema ? h("details", {}, h("summary", {}, "Schema of the answer"),
                    h("pre", {class: "json"}, JSON.stringify(wait.schema, null, 2))) : null,
    problem, send);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    problem.hidden = true;
    send.disabled = true;
    try {
      await call("tasks.respond", {task_id: task.id, value: read()});
      onAnswered();
    } catch (error) {  // a refused answer (RpcError -32602), bad JSON, or a failed call: said here
      problem.textContent = error.message || String(error);
      problem.hidden = false;
    } finally {
      send.disabled = false;
    }
  });
  return form;
}
