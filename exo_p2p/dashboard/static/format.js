// The chat's output format: what the "Output format" field holds as the OpenAI chat
// `response_format` the node enforces while it decodes (free text, any JSON object, or JSON
// that validates against a JSON schema). Pure: checked in the page before anything is sent.

export const FORMAT_KINDS = [
  ["text", "free text"],
  ["json_object", "JSON object"],
  ["json_schema", "JSON schema"],
];

/** The schema's name as OpenAI requires it ([A-Za-z0-9_-], 1–64): its title, else "schema". */
export function schemaName(schema) {
  const title = typeof schema.title === "string" ? schema.title.replace(/[^A-Za-z0-9_-]/g, "_").slice(0, 64) : "";
  return title || "schema";
}

/**
 * `kind` ("text", "json_object", "json_schema") and the schema text as
 * `{format}` (the `response_format` to send, null for free text) or `{error}` (why not).
 */
export function responseFormat(kind, schemaText) {
  if (kind === "json_object") return { format: { type: "json_object" } };
  if (kind !== "json_schema") return { format: null };
  const text = (schemaText || "").trim();
  if (!text) return { error: "write a JSON schema, or pick another output format" };
  let schema;
  try {
    schema = JSON.parse(text);
  } catch (exc) {
    return { error: `the schema is not valid JSON: ${exc.message}` };
  }
  if (schema === null || typeof schema !== "object" || Array.isArray(schema)) {
    const what = schema === null ? "null" : Array.isArray(schema) ? "an array" : `a ${typeof schema}`;
    return { error: `the schema is ${what}; a JSON schema is an object` };
  }
  return { format: { type: "json_schema", json_schema: { name: schemaName(schema), schema, strict: true } } };
}
