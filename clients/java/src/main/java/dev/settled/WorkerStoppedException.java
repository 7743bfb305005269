package dev.settled;

/** The worker stopped on an error retrying cannot fix (bad token, refused parameter); the message names the code. */
public class WorkerStoppedException extends SettledException {
    private final ProblemException problem;

    public WorkerStoppedException(String message, ProblemException problem) {
        super(message, problem);
        this.problem = problem;
    }

    public ProblemException problem() { return problem; }
}
