package io.ckpt.client;

import java.util.List;
import java.util.Map;

/**
 * Event is one event from the agent: its name and its JSON fields, as
 * sent (fields a newer agent adds included). {@code get("checkpoint_size")}
 * reads a field; {@code getLong} and {@code getString} read typed ones.
 */
public final class Event {
    private final Map<String, Object> fields;

    Event(Map<String, Object> fields) {
        this.fields = fields;
    }

    /** Parses an event line; null when it is not a JSON object. */
    static Event parse(String line) {
        try {
            Object v = Json.parse(line);
            return v instanceof Map ? new Event(Json.object(v)) : null;
        } catch (IllegalArgumentException e) {
            return null;
        }
    }

    /** The event's name: hello, synced, completed, failed, aborted, status, restored, following or error. */
    public String name() {
        return getString("event");
    }

    /** The id of the request the event answers (a String or a Long), null when none. */
    public Object id() {
        return fields.get("id");
    }

    /** The task the event is about, null when it names none. */
    public String task() {
        return getString("task");
    }

    /** The checkpoint number the event is about, 0 when it names none. */
    public long checkpoint() {
        return getLong("checkpoint");
    }

    /** Every field of the event, unmodifiable. */
    public Map<String, Object> fields() {
        return fields;
    }

    /** A field, null when absent. */
    public Object get(String key) {
        return fields.get(key);
    }

    /** A numeric field, 0 when absent or not a number. */
    public long getLong(String key) {
        Object v = fields.get(key);
        return v instanceof Number ? ((Number) v).longValue() : 0;
    }

    /** A string field, null when absent or not a string. */
    public String getString(String key) {
        Object v = fields.get(key);
        return v instanceof String ? (String) v : null;
    }

    /** A boolean field, false when absent. */
    public boolean getBoolean(String key) {
        return Boolean.TRUE.equals(fields.get(key));
    }

    /** The tasks of a status event, each a map of its fields. */
    @SuppressWarnings("unchecked")
    public List<Map<String, Object>> tasks() {
        Object v = fields.get("tasks");
        return v instanceof List ? (List<Map<String, Object>>) v : List.of();
    }

    /** The event as one line of JSON. */
    @Override
    public String toString() {
        return Json.write(fields);
    }
}
