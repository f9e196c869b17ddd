package io.ckpt.client;

/** AbortedException: the checkpoint was aborted before it completed. */
public class AbortedException extends CkptException {
    private static final long serialVersionUID = 1L;
    private final transient Event event;

    public AbortedException(Event event) {
        super("checkpoint " + event.checkpoint() + " of task " + event.task() + " aborted");
        this.event = event;
    }

    /** The aborted event. */
    public Event event() {
        return event;
    }
}
