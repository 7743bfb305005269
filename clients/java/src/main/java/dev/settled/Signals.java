package dev.settled;

import java.lang.reflect.Method;
import java.lang.reflect.Proxy;
import java.util.ArrayList;
import java.util.List;

/**
 * SIGTERM / SIGINT through sun.misc.Signal (module jdk.unsupported, reached by reflection), so
 * that a stop ends run() and the program exits with its own status: from a shutdown hook alone
 * the JVM would exit 143.
 */
final class Signals {
    private Signals() {}

    /** Installs handlers calling {@code stop}; what restore() needs, or null where unavailable. */
    static Object install(Runnable stop) {
        List<Object[]> previous = new ArrayList<>();
        try {
            Class<?> signalClass = Class.forName("sun.misc.Signal");
            Class<?> handlerClass = Class.forName("sun.misc.SignalHandler");
            Method handle = signalClass.getMethod("handle", signalClass, handlerClass);
            Object handler = Proxy.newProxyInstance(Signals.class.getClassLoader(), new Class<?>[] {handlerClass}, (proxy, method, args) -> {
                if (method.getName().equals("handle")) stop.run();
                else if (method.getName().equals("hashCode")) return System.identityHashCode(proxy);
                else if (method.getName().equals("equals")) return proxy == args[0];
                else if (method.getName().equals("toString")) return "settled worker signal handler";
                return null;
            });
            for (String name : new String[] {"TERM", "INT"}) {
                Object signal = signalClass.getConstructor(String.class).newInstance(name);
                previous.add(new Object[] {handle, signal, handle.invoke(null, signal, handler)});
            }
        } catch (Throwable e) {
            // No sun.misc.Signal here: the shutdown hook still stops the worker.
        }
        return previous.isEmpty() ? null : previous;
    }

    @SuppressWarnings("unchecked")
    static void restore(Object installed) {
        for (Object[] p : (List<Object[]>) installed) {
            try {
                ((Method) p[0]).invoke(null, p[1], p[2]);
            } catch (Throwable ignored) {
                // Best effort.
            }
        }
    }
}
