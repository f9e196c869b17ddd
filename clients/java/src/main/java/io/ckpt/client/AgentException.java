package io.ckpt.client;

/**
 * AgentException is a failed or error event from the agent: {@link #code()}
 * is the protocol's code (one of the constants below; a newer agent may
 * send another), the message says why, {@link #event()} is the event.
 * Retry on {@link #UNAVAILABLE}; fix the request on {@link #BAD_REQUEST}.
 */
public class AgentException extends CkptException {
    private static final long serialVersionUID = 1L;

    /** The request could not be parsed or is invalid. */
    public static final String BAD_REQUEST = "bad_request";
    /** The task, checkpoint or restore source does not exist. */
    public static final String NOT_FOUND = "not_found";
    /** An older checkpoint number, a non-empty restore target, a fenced agent. */
    public static final String CONFLICT = "conflict";
    /** The agent cannot serve it now (queue full, outage, shutdown, timeout, disk full): retry later. */
    public static final String UNAVAILABLE = "unavailable";
    /** The peer's credentials do not allow this job, task or directory. */
    public static final String FORBIDDEN = "forbidden";
    /** Anything else; the message names the problem. */
    public static final String INTERNAL = "internal";

    private final String code;
    private final String agentMessage;
    private final transient Event event;

    public AgentException(String code, String message, Event event) {
        super(code + ": " + message);
        this.code = code;
        this.agentMessage = message;
        this.event = event;
    }

    /** The error an event with an error object stands for. */
    static AgentException of(Event ev) {
        var err = Json.object(ev.get("error"));
        Object code = err.getOrDefault("code", INTERNAL);
        Object msg = err.getOrDefault("message", "");
        return new AgentException(String.valueOf(code), String.valueOf(msg), ev);
    }

    /** The protocol's error code. */
    public String code() {
        return code;
    }

    /** The agent's message, without the code. */
    public String agentMessage() {
        return agentMessage;
    }

    /** The failed or error event. */
    public Event event() {
        return event;
    }
}
